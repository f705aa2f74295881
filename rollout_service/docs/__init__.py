"""Documentation in, verdicts with evidence out: the console's UI inventory (crawled), pages of
documentation read into procedures, the static check of each step against the inventory, a
verifiable task drafted from each procedure, and a verdict per procedure. See README.md."""
