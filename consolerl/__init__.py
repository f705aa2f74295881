"""Small shared module for what crosses component boundaries: the error hierarchy and
(later) the typed values that travel between Ray actors. Keep it small."""
