"""Cost and memory models: how long a kernel takes (`compute`), what a rank holds (`memory`)."""
