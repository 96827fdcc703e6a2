"""The dense teacher itself: the baseline every compressed artifact is weighed against."""
