"""The front door: `Config`, the backend protocol and registry, drafter names, and
`load`, which gives a `Runner`."""
