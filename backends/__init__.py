"""specsample's backends, installed as `specsample_backends` and chosen by name."""
