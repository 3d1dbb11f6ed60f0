"""The report: one trace (or capture folder, or several rank traces) and its evidence, as `profkit.report/1`."""

from profkit.report.build import ReportOptions, build_report
from profkit.report.model import SCHEMA, Report

__all__ = ["SCHEMA", "Report", "ReportOptions", "build_report"]
