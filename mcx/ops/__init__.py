"""One module per verb; each composes the library and returns data (never prints or exits)."""
