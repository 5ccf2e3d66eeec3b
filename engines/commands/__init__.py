"""One module per `voxfleet` subcommand."""
