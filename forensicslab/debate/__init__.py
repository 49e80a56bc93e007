"Debate study (MAD-Sherlock): multi-agent debate with retrieval for out-of-context image-caption pairs."
