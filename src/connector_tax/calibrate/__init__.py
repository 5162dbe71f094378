"""Calibration: the simulator's engine profile fitted from a real study's records (fit.py), and its
error measured by replaying a real study in virtual time (check.py); what `ctax calibrate` (commands/calibrate.py) prints (render.py)."""
