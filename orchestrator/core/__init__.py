"""The bottom layer: the data every other layer speaks — errors, limits, files, profiles, clusters, plans, timelines.

It imports nothing of the project above it and neither torch nor Ray, so that planning, simulating and the
command line's input checks stay cheap to import.
"""
