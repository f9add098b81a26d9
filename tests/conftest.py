pytest_plugins = ["hwdist.testing.pytest_plugin"]
