"""Graph nodes, one module each. Nodes read state, call one collaborator, return an update."""
