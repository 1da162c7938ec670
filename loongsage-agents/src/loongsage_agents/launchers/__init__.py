"""Black-box agents: any program (``command``) and real agent CLIs run against the router."""
