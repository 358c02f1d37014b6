"""The microgpt tab of TensorBoard (tab: the plugin and its routes; attention: what it shows)."""

from microgpt.commands.tab.tab import MicrogptPlugin as MicrogptPlugin
