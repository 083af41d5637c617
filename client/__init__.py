if __name__ != "fedbayes.client":  # fedbayes/client is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.client, not {__name__}")
