"""Per-minute endpoint figures inferd records for its charts."""
