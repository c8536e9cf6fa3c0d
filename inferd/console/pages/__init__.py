"""The console's pages, one module per feature (as vLLM's per-feature
routers): each holds its routes and handlers over the shared request
plumbing of `inferd.console.web`."""
