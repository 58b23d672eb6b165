"""The script Streamlit runs for `kvtrace dashboard`: the page lives in analyze.dashboard.page."""

from analyze.dashboard.page import main

main()
