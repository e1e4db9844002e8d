"""A user script with a bug: it fails at start-up with a Python traceback."""

config = {"learning_rate": 1e-3}
print("loading config", flush=True)
print(config["lr"])  # KeyError: a genuine user error, not an injected fault
