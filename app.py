"""`streamlit run app.py` from a checkout: the dashboard's page lives in analyze.dashboard.page."""

from analyze.dashboard.page import main

main()
