if __name__ != "fedbayes.protos":  # fedbayes/protos is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.protos, not {__name__}")
