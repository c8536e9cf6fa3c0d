"""The web console at /console: server-rendered pages over the service layer."""
