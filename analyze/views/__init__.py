"""What people look at: figures, reports, exports and triage tables rendered from the reader's ParseResult.
Views import the reader core; the core never imports a view."""
