"""Your own job types: every definition in JOB_DEFINITIONS is registered beside the built-in ones.

The engine imports this package whenever it exists (no setting needed), and `sam build` ships it
with every function, since it sits in src/ beside `engine`. Add a module per job type and list its
definition below; docs/jobtypes.md says what a definition holds.
"""

from jobtypes.extract_contact import EXTRACT_CONTACT

JOB_DEFINITIONS = [EXTRACT_CONTACT]
