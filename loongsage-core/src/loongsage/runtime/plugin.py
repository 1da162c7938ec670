"""Core's built-in runtime plugins, registered through the same hooks as third-party code."""

from loongsage.hookspecs import hookimpl
from loongsage.runtime.window import NoWindowParams, WindowedFifoParams, WindowGatedParams


@hookimpl
def loongsage_register_window_policies(register):
    register("no_window", "loongsage.runtime.window:NoWindow", params=NoWindowParams,
             doc="Dispatch up to capacity C; train on whichever groups finish first.")
    register("window_gated", "loongsage.runtime.window:WindowGated", params=WindowGatedParams,
             doc="Stall dispatch while a straggler is a whole window behind the newest group.")
    register("windowed_fifo", "loongsage.runtime.window:WindowedFifo", params=WindowedFifoParams,
             doc="Collect finished groups in dispatch order up to a skew of one batch.")
