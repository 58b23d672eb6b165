"""What people look at: figures, reports, exports and the dashboard launcher, built from the reader's
ParseResult. Views import the reader core; the core never imports a view."""
