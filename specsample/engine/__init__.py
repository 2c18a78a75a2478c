"""The round and the loop: one speculative round for chains and trees (`round`, `tree`),
the generation loop (`generate`), run options and K policies, the costs measured on this
machine (`cost`), and what the loops share (`runs`)."""
