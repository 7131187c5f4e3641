"""columns_estimator.py's program named for the project: nothing in it is changed.

    PYTHONPATH=docs/examples python -m trainers.estimator_main \\
        --estimator_program=columns_program:PROGRAM
    PYTHONPATH=docs/examples python -m launch.parity --workers=1 \\
        --estimator_program=columns_program:PROGRAM --model=columns_port:SPEC \\
        --assignment_map=docs/examples/columns_map.json \\
        --optimizer=adagrad --learning_rate=0.05 --learning_rate_schedule=constant

docs/MIGRATION.md, "Feature columns", walks through it.
"""

import columns_estimator

from trainers.program import EstimatorProgram

PROGRAM = EstimatorProgram(
    model_fn=columns_estimator.model_fn,
    params=columns_estimator.PARAMS,
    input_fn=columns_estimator.input_fn,
    serving_input_receiver_fn=columns_estimator.serving_input_receiver_fn,
)
