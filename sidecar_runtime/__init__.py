"""What both sidecars share: listen addresses, rich status errors, serving."""
