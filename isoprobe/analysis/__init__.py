"""Analysis of sweeps: the study table, rank associations, figures and the HTML report."""
