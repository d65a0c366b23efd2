"""The web layer every app shares: the htmx request type, partial rendering and the middleware
that sets caching headers and keeps sessions alive. It imports no app."""
