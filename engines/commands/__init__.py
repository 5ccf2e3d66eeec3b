"""One module per `voxfleet` subcommand (and `arguments`, the argument types they share)."""
