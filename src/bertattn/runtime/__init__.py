"""The machine bertattn runs on: CPU facts (:mod:`.cpu`), threads and their governor
(:mod:`.threads`), OpenMP (:mod:`.openmp`), the per-machine probe cache (:mod:`.probe`), devices
(:mod:`.device`) and chunk workers (:mod:`.workers`). Nothing here knows about models."""
