"Triage study (\"Dissecting Agentic Forensics\"): auditors, judges, fusion baselines, case reports, Table 4 and Figure 2."
