#!/usr/bin/python3
"""plot_allreduce_test.py: the legend of bench/plot_allreduce.py names the MPI library of
the run it draws (the sweep's "mpi_library"), not a version written into the script (it
said "Open MPI 4.1.4" whatever MPI had run). Needs no matplotlib: only the labels."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_allreduce  # noqa: E402


def sweep(**fields):
    s = {"backend": "ring", "buffers": "private", "launch": "blocking",
         "rows": [{"bytes": 8, "busbw": 0.1, "mpi_busbw": 0.2}]}
    s.update(fields)
    return s


class Legend(unittest.TestCase):
    def test_names_the_library_of_the_run(self):
        label = plot_allreduce.mpi_label(sweep(mpi_library="MPICH Version: 9.8.7"))
        self.assertEqual(label, "MPI_Allreduce (MPICH Version: 9.8.7), same run (private, blocking)")

    def test_keeps_the_library_up_to_its_first_comma(self):
        label = plot_allreduce.mpi_label(sweep(mpi_library="Open MPI v5.0.3, package: Open MPI x, ident: 5.0.3"))
        self.assertEqual(label, "MPI_Allreduce (Open MPI v5.0.3), same run (private, blocking)")

    def test_says_when_the_sweep_did_not_record_it(self):
        for s in (sweep(), sweep(mpi_library=None)):
            self.assertEqual(plot_allreduce.mpi_label(s),
                             "MPI_Allreduce (MPI library not recorded), same run (private, blocking)")

    def test_each_sweep_its_own_library(self):
        got = plot_allreduce.labels([sweep(mpi_library="A 1"), sweep(mpi_library="B 2", buffers="symmetric"),
                                     sweep(rows=[{"bytes": 8, "busbw": 0.1}])])
        self.assertEqual(got, ["ringtrain ring, private buffers, blocking",
                               "MPI_Allreduce (A 1), same run (private, blocking)",
                               "ringtrain ring, symmetric buffers, blocking",
                               "MPI_Allreduce (B 2), same run (symmetric, blocking)",
                               "ringtrain ring, private buffers, blocking"])


if __name__ == "__main__":
    unittest.main()
