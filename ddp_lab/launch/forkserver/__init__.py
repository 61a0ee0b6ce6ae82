"""The fork server: a process that imported torch once and forks the ranks.

Read in this order: ``protocol`` (the messages, and how they travel with their
descriptors) -> ``client`` (the launcher's side: start the server once per process, ask for
ranks, route the answers to the run that asked) -> ``server`` (the server's loop: fork,
signal, report exits) -> ``reaper`` (what ranks leave behind, put down when their run ends)
-> ``process_tree`` (the one way to signal, list and kill a tree of processes).
"""
