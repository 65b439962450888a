"""The `journal` command line: a thin click layer over the public `journal` API."""
