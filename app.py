"""`streamlit run app.py` from a checkout: the dashboard's page lives in kvtrace.analyze.dashboard.page."""

from kvtrace.analyze.dashboard.page import main

main()
