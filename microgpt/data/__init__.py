"""The data: one interface (dataset.load_data -> Data) whatever the format: lines, text, repeats."""
