"""Named queries in child processes (`query.<name>.isolation=process`).

`plan` derives what a child runs with from the daemon's config (pure);
`child` is the child's entry point (`python -m runtime.isolation.child`);
`supervisor` is the daemon's side: it starts a child, reads its status
lines, forwards pause/resume and stops it.
"""
