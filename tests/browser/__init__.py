"""Swagger UI driven in headless Chromium (selenium, Debian's chromedriver): tox -e browser."""
