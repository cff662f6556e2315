"""MiniDesk: a hybrid GUI + tool task suite (mail, files, sheet, settings, calendar) on local pages."""
