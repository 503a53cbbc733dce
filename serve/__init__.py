"""The migration pipeline (detect → fix → retrieve → propose → validate → patch) and its fronts:
bulk repo rewriting (CLI), the HTTP patch service (FastAPI) and the agent tool (MCP)."""
