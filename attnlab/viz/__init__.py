"""Seeing inside: the layer walkthrough (explain.py); attention pages come later."""
