"""Command line: `servingtopology plan | simulate | sweep | validate | operator`."""
