"""The script Streamlit runs for `kvtrace dashboard`: the page lives in kvtrace.analyze.dashboard.page."""

from kvtrace.analyze.dashboard.page import main

main()
