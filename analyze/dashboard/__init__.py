"""The dashboard's runtime: the Streamlit page, its launcher and server process, the preload of an opened log,
following a log as it is written, and the raw text beside the charts. It draws with the views and reads with
the reader core; nothing below it imports it back."""
