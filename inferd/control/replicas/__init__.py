"""Replicas: the registry (sole writer of replica rows), the reconciler that
makes them match what each endpoint should have, and the autoscaling policy
and load views it decides from."""
