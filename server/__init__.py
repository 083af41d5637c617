if __name__ != "fedbayes.server":  # fedbayes/server is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.server, not {__name__}")
