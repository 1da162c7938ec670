"""AgentFlow: the router any agent can call unmodified, and the TITO trajectory store.

Import-light: the package root imports no torch and no web stack; use the submodules
(``loongsage.agentflow.server.Router``, ``loongsage.agentflow.store.TrajectoryStore``).
"""
