"""The migration pipeline (results, checks, tree, reports: one orchestrator in pipeline.py) and its fronts
that parse, call the pipeline and render: the CLI (cli.py), the HTTP service (http.py), the MCP tool (mcp.py)."""
