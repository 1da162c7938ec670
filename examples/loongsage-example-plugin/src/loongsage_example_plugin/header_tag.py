"""A router middleware copying one request header into the trajectory's metadata, so a client
can tag its calls (a task id, an experiment arm) and the saved trajectories carry the tag."""

from loongsage.plugin import RouterMiddleware


class HeaderTag(RouterMiddleware):
    def __init__(self, settings, params):
        self.params = params

    async def on_request(self, ctx):
        value = ctx.headers.get(self.params.header.lower())
        if value is not None:
            ctx.trajectory.metadata[self.params.key] = value
