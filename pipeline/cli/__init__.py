"""The `hnce` command line: one thin module per subcommand; the logic lives in the packages."""
