"""The one cost engine: the cost terms, the simulator (the one interpreter of a lowered schedule) and its
group-level fast mode, which the planners and the controller build on instead of modelling time again."""
