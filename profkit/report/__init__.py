"""The report: one trace (or capture folder, or several rank traces) and its evidence, as `profkit.report/1`."""

from profkit.report.build import build_report
from profkit.report.model import SCHEMA, Report
from profkit.report.options import ReportOptions

__all__ = ["SCHEMA", "Report", "ReportOptions", "build_report"]
