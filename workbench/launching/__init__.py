"""N processes from a notebook: the one launcher (`launch`: `wb.launch` for a RunConfig,
`launch_function` for your function, accelerate's notebook_launcher run bounded) and how its
children start and stop (`processes`: a fork server that holds no thread, each child in its own
process group, stopped with its descendants). Above the core and the planner: it checks that N
runs fit before any starts, and each child runs the core's loop.
"""
