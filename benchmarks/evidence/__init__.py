"""Evidence from the real wheels of each release, without a GPU: static checks, runtime samples, rehearsals."""
