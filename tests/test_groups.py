"""Runs that differ only by seed form a group, named after their sweep job without the seed."""

from microgpt.groups import group_name, group_runs


def run(name: str, seed: int, heads: int, **other) -> dict:
    config = {"seed": seed, "model": {"n_head": heads}, "out_dir": f"/runs/{name}", "threads": 1}
    return {"name": name, "config": {**config, **other}}


def test_runs_differing_only_by_seed_are_one_group_in_seed_order():
    runs = [
        run("heads=4,seed=3", 3, 4),
        run("heads=1,seed=1", 1, 1, train={"progress": True}),
        run("heads=4,seed=1", 1, 4, threads=2, device="cpu"),  # how it ran: not the experiment
        run("heads=1,seed=2", 2, 1, train={"progress": None}),  # nor the progress bar
        run("heads=4,seed=2", 2, 4, optim={"lr": 0.01}),  # another experiment
    ]
    groups = group_runs(runs, lambda r: r["config"], lambda r: r["name"])
    expected = [("heads=4", [1, 3]), ("heads=1", [1, 2]), ("heads=4 #2", [2])]
    assert [(g.name, g.seeds) for g in groups] == expected
    assert [r["name"] for r in groups[0].runs] == ["heads=4,seed=1", "heads=4,seed=3"]
    assert groups[1].n == 2


def test_a_group_is_named_after_its_job_without_the_seed():
    assert group_name("heads=4,seed=2") == "heads=4"
    assert group_name("seed=2,heads=4") == "heads=4"
    assert group_name("optim.lr=0.01,seed=12,heads=2") == "optim.lr=0.01,heads=2"
    assert group_name("seed=2") == "all"
    assert group_name("2026-11-27/10-00-00") == "2026-11-27/10-00-00"
