"""The shared vocabulary of rules and store: table schemas and keys, change sets, and the
protocol a store snapshot offers to the rules. It imports neither `rules` nor `store`."""
